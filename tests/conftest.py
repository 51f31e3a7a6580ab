import os

# Tests start real workers on this machine; nothing may reach beyond loopback.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
