"""etcd for hpclaunch: the v3 client (``client``) and the per-job server (``sidecar``).

Neither imports torch. The client needs the ``etcd`` extra (``pip install
'hpclaunch[etcd]'``) and imports it only when a connection is made.
"""
