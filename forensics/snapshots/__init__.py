"""Snapshots on disk: the directories libtag writes them to, and the catalog
of every snapshot forensics has seen."""
