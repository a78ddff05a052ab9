-- The network between the nodes: one row per RDMA port (InfiniBand, or RoCE with its Ethernet
-- interface) per sample, read from sysfs by the agent (agent/sources/fabric.py). Columns after
-- netdev are declared in schema/fields.py (FABRIC_FIELDS): rates (rx_kbs, tx_kbs, net_*_kbs,
-- xmit_wait_per_s) are per second between two samples, NULL on a port's first; error counters are as
-- the kernel shows them. job_id is set when one job holds the node alone (its traffic is the job's),
-- NULL on a shared or idle node (the traffic is the node's). Daily partitions, plain retention.
CREATE TABLE jobpulse.fabric_samples (
    cluster                         text        NOT NULL,
    node                            text        NOT NULL,
    ts                              timestamptz NOT NULL,
    device                          text        NOT NULL,
    port                            smallint    NOT NULL,
    job_id                          text,
    netdev                          text,
    link_layer                      text,
    port_state                      smallint,
    phys_state                      smallint,
    rate_gbps                       real,
    width                           smallint,
    rate_max_gbps                   real,
    width_max                       smallint,
    rx_kbs                          bigint,
    tx_kbs                          bigint,
    xmit_wait_per_s                 bigint,
    symbol_error                    bigint,
    link_downed                     bigint,
    link_error_recovery             bigint,
    port_rcv_errors                 bigint,
    port_rcv_remote_physical_errors bigint,
    port_xmit_discards              bigint,
    local_link_integrity_errors     bigint,
    excessive_buffer_overrun_errors bigint,
    hw_out_of_sequence              bigint,
    hw_packet_seq_err               bigint,
    hw_local_ack_timeout_err        bigint,
    hw_np_ecn_marked_roce_packets   bigint,
    net_rx_kbs                      bigint,
    net_tx_kbs                      bigint,
    net_rx_dropped                  bigint
) PARTITION BY RANGE (ts);
CREATE INDEX fabric_samples_node ON jobpulse.fabric_samples (cluster, node, ts);
CREATE INDEX fabric_samples_job ON jobpulse.fabric_samples (job_id, ts) WHERE job_id IS NOT NULL;
