"""vessel-workers, execution side: the sandbox runner, the service caller, the Celery
tasks, result shaping and the worker entry points."""
