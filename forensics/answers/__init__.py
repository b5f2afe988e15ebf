"""The answers: who owns an address, the inspect document, growth between
snapshots, leaks, the report's data - plain data and JSON documents.

Imports forensics.reader and below; never rich, never the command line.
"""
