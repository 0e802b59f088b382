"""vessel-workers, enqueue side: deployments and agent packages, the tool catalogue,
queue names and routing, the Celery app and the client API a platform calls."""
