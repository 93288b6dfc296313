"""The API's HTTP plumbing: authorization, dependencies, streaming uploads and downloads, caching headers, ETags
and the fleet's resolve path, the build long poll, metrics."""
