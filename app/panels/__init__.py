"""The docks and panes of the main window, one module each: inspector (with its attention
panel), breakpoints, logit lens, generation, module tree, source and the step bar.
Each panel that adds menu entries has an ``attach(main_window)`` function."""
