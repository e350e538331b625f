"""The multi-job controller: store, scheduling loop, REST API and the CLI verbs over it."""
