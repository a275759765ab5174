-- The service's MySQL/MariaDB account: what it needs, and nothing more.
-- Replace the database (`flashsale`), the host pattern and the password;
-- run it on the primary (replication copies it to the replicas).
--
-- It must NOT hold SUPER, READ_ONLY ADMIN or ALL PRIVILEGES: with them it
-- writes to a server whose read_only is ON (a replica not promoted yet, an
-- old primary fenced after a failover) as if it were the primary, and the
-- books split. Without them such a server refuses the writes (error 1290):
-- the service answers 503, its workers keep every order and write it once
-- the promoted primary takes writes.
CREATE USER IF NOT EXISTS 'flashsale'@'%' IDENTIFIED BY 'change-me';
-- The books: the service creates the database and its tables, and migrates
-- them (ALTER, INDEX); it reads and writes their rows.
GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, ALTER, INDEX ON `flashsale`.* TO 'flashsale'@'%';
-- SHOW SLAVE HOSTS, to tell asynchronous replicas (`flashsale_books_topology`);
-- MariaDB 10.5+ (REPLICATION SLAVE on older servers and on MySQL).
GRANT REPLICATION MASTER ADMIN ON *.* TO 'flashsale'@'%';
