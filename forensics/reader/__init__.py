"""Reading a libtag process's memory: a core or a live process, libtag's
structures in it, its heap blocks, pointers and symbols.

Imports only forensics.core and the package-wide modules below it.
"""
