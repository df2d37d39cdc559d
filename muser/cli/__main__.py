"""`python -m muser.cli ...` == `muser ...`."""
import sys

from . import main

sys.exit(main())
