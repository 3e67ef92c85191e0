"""The web console (§40): pages and static files served by the kernel at `/ui`.

The page is hand-written HTML, CSS and JavaScript modules under `static/`, shipped in the
wheel, with no build step and nothing fetched from elsewhere at run time. It reads and
writes through the `/v0` API like any client. Must not import a store or the service layer.
"""
