"""Reusable widgets with no knowledge of the main window: the heatmap, the tensor view, the
shape table, the slice bar, the divergence legend, and the small pieces every pane shares
(:mod:`.common`: ElidedLabel, LayoutFirewall, titled, make_opaque)."""
