"""The block diagram, in three layers: :mod:`~app.diagram.layout` (what goes where),
:mod:`~app.diagram.items` (how one box, frame or edge is drawn) and :mod:`~app.diagram.view`
(the zoomable, clickable ``QGraphicsView``)."""
