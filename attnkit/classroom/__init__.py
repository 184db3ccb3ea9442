"""Classroom tools: course (the lesson table), notebooks (headers, execution), labgen (labs from
solutions), checking (the check reports), grading (grading submissions), site (the static website),
figures (the registry of diagrams that `make figures` draws).
"""
