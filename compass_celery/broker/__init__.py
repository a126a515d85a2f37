"""Per-worker queues on the broker: kombu's Redis layout and RabbitMQ (AMQP), and the
steps that drain, stage, move and lease their messages.
"""
