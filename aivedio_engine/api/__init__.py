"""The HTTP front end: FastAPI app factory, problem+json errors, authentication, routes."""
