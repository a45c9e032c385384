-- The CDC user deltaforge connects as (dsn: mysql://cdc:cdc@localhost:3306/shop).
CREATE USER IF NOT EXISTS 'cdc'@'%' IDENTIFIED BY 'cdc';
GRANT REPLICATION SLAVE, REPLICATION CLIENT, SELECT ON *.* TO 'cdc'@'%';
