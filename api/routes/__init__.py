"""One router per resource: each parses a request, calls one service (api/services/) and answers with a public
schema (api/schemas/)."""
