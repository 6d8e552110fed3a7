"""The app's Qt-free logic: load models, trace, step, edit, generate, train your own, progress."""
