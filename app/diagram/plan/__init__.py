"""The diagram without Qt: geometry, folding of repeats, the layout (what goes where), routing."""
