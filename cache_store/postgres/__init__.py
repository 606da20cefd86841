"""The PostgreSQL backend: a named cache on a server shared by a render farm, and the server URL it is reached by."""
