"""The FastAPI front end: uploads, builds, the engine catalog and resolution."""
