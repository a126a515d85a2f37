"""The worker side: the bootstep, its runtime, the per-task path, recovery of dead
workers' queues, and the demand a worker serves.
"""
