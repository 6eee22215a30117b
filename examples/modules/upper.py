#!/usr/bin/env python3
"""Forward half of the `upper` example: ASCII lower case to upper case."""
from ndd_module import serve

serve(lambda payload: payload.upper())
