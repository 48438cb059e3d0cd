"""corectl-backup: backups of what the head node holds, installed by corectl's role backup (standard library only).

    corectl-backup take [--add FILE]... [--json]   a backup now; the oldest beyond the retention count are removed
    corectl-backup list [--json]                   every backup with its size, age and whether it verifies
    corectl-backup verify NAME                     exit 0 when every file of that backup matches its checksum
    corectl-backup restore NAME [--check] [--force]
                                                   the database and saved state of that backup back in place
                                                   (slurmdbd and slurmctld stopped first; --check: only whether it
                                                   would: it verifies, and the database has no job newer than it)

A backup is one directory <destination>/<UTC time>, written as .<UTC time>.partial and renamed when complete:
  slurm_acct_db.sql.gz       the accounting database, one transaction (mysqldump --single-transaction)
  slurmctld-state.tar.gz     slurmctld's saved state (the queue, fair-share usage), when this host has it
  prometheus-tsdb.tar.gz     Prometheus's data, a snapshot through its TSDB snapshot API (admin API), when the
                             settings name prometheus_url; the snapshot is removed from Prometheus's disk after
  corectl-site.tar.gz        what corectl keeps on its control host (added by `corectl backup`: run records,
                             failure history, the site's secrets as ansible-vault keeps them, encrypted)
  MANIFEST.json              each file's size and SHA-256; a backup without it is incomplete
Settings: /etc/corectl/backup.json (destination, retention, database, state_dir, metrics_dir, prometheus_url).

Each `take` writes its outcome for node_exporter's textfile collector (<metrics_dir>/corectl_backup.prom, when that
directory exists): when the last backup succeeded, whether the last attempt did, its size and how many are kept;
role monitoring's HeadBackupFailed and HeadBackupTooOld alert on them."""
