"""The API's services: each does one request's work across the catalog, the blobs and the broker, for the routes
and the dashboard alike; neither calls the other."""
