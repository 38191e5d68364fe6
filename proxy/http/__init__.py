"""The HTTP shell around every request: the middleware, request ids, the body budget."""
