from .process import exit_now, main

exit_now(main())
