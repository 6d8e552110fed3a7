"""Top-level windows: the debugger (:mod:`.main_window`), the side-by-side comparison
(:mod:`.compare_window`) and the dialogs they open (:mod:`.dialogs`)."""
