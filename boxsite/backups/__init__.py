"""``manage.py backup`` and ``restore``: the database, the data directory and the vault key in
one tar file (docs/guide/backups.md).

``archive`` writes and reads the tar file and its manifest, ``database`` takes and puts back the
database snapshot, ``datadir`` says which files of the data directory belong in a backup.
"""
