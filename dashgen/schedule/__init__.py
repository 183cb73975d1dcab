"""Schedules as data: the problem, the IR, the builders, and the three views of a schedule
(verify, simulate, show/gantt), plus its lowering to a task table. No torch, no driver."""
