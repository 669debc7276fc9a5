import sys

from torchdoctor._cli import main

sys.exit(main())
