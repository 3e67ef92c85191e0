"""One module per resource; each route parses, calls one service method, and renders."""
