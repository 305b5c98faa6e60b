"""HTTP surface of whip-ingest: WHIP endpoint, REST API, auth, admission, CLI."""
