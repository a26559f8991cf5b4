"""In-process tests that want the verbs and the admin endpoints from one Flask object.

`tessera serve` runs them on two listeners (extender/http/admin.py says why); a test client has
no listener, so `both()` routes the admin paths to the admin app and the rest to the verbs app.
"""

from __future__ import annotations

from flask import Flask

from extender.http.admin import ADMIN_PATHS, create_admin_app


def both(verbs: Flask, prefix: str = "/tessera") -> Flask:
    """A Flask object whose WSGI callable dispatches by path: admin paths to the admin app."""
    state = verbs.extensions["tessera"]
    admin = create_admin_app(state["extender"], state["registry"], prefix=prefix)
    combined = Flask("tessera-both")

    def dispatch(environ, start_response):
        target = admin if environ.get("PATH_INFO", "") in ADMIN_PATHS else verbs
        return target.wsgi_app(environ, start_response)

    combined.wsgi_app = dispatch
    combined.extensions["tessera"] = state
    return combined
