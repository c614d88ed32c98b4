"""gunicorn entry point: `gunicorn -c api/gunicorn.conf.py api.wsgi:app`."""
from . import create_app

app = create_app()
