"""A phase over many processes and devices: who this process is and host-side agreement (hosts.py), the
("data", "sequence", "expert") device mesh and shardings (mesh.py), optimizer state in host memory (offload.py), and the
worker process a backend launches per host (worker.py)."""
