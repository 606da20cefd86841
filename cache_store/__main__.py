"""`python -m cache_store`: manage a CHAI cache folder from the command line."""
import sys

from .cli import main

sys.exit(main())
