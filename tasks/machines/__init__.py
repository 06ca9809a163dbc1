"""Several machines of one box (``BOX_MACHINE``): where a workspace lives, which queue its runs
go to, how another machine's web process reads it, and how it moves (docs/internals/scaling.md).

With ``BOX_MACHINE`` unset (one machine) nothing here is called: every caller checks the setting
first, so one machine pays no query for it.
"""
