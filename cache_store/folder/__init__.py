"""The cache-folder backend: latent files, an SQLite manifest and its change log, recovery and maintenance."""
