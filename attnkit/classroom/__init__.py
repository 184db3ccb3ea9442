"""Classroom tools: course (the lesson table), notebooks (headers, execution), labgen (labs from
solutions), checking (the check reports; its parts: cases, comparing, call_rules, kernel_guards),
grading (grading submissions), site (the static website), figures (the registry of diagrams that
`make figures` draws).
"""
