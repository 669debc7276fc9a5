import sys

from torchdoctor._cli.main import main

sys.exit(main())
