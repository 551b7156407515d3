"""``python -m dlrun`` is the same as the ``dlrun`` command."""
from .cli import main

main()
