"""esfuse: documentation stored in Elasticsearch, mounted as a read-only file tree."""

__version__ = "0.1.0"
