"""esgrep: GNU grep over an esfuse mount, with Elasticsearch choosing the files to read."""
