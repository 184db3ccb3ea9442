"""Checks for the course's labs: one module per lab, one check function per exercise."""
