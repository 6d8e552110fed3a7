"""The app's Qt-free logic: loading models, tracing, stepping rules, edits, generation, progress."""
