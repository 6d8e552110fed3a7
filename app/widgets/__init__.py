"""Reusable widgets with no knowledge of the main window: the heatmap, the tensor view and
the shape table."""
