"""Build workers: the Celery app, the build backends and the machine probe."""
