"""The block diagram. :mod:`~app.diagram.plan` computes it without Qt (geometry, folding,
the layout of what goes where, routing; tested headless); the modules here draw it with Qt:
:mod:`~app.diagram.items` (how one box, frame or edge is drawn), :mod:`~app.diagram.view`
(the zoomable, clickable ``QGraphicsView``), :mod:`~app.diagram.grad_tints` (boxes tinted
by gradient norm) and :mod:`~app.diagram.divergence` (the compare window's rings and badges)."""
