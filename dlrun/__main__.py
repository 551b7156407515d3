"""``python -m dlrun`` is the same as the ``dlrun`` command."""
from .console import main

main()
