CREATE TABLE t(id INTEGER PRIMARY KEY, k TEXT, v INTEGER, pad TEXT);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < 20000)
INSERT INTO t SELECT x, printf('key%06d', (x*7919) % 20000), (x*31337) % 1000, hex(zeroblob(x % 64)) FROM c;
CREATE INDEX t_k ON t(k);
CREATE TABLE u(g INTEGER, s INTEGER);
INSERT INTO u SELECT v % 37, sum(v) FROM t GROUP BY v;
UPDATE t SET v = v + 1 WHERE id % 10 = 0;
DELETE FROM t WHERE id % 17 = 0;
SELECT count(*), sum(v), min(k), max(k), sum(length(pad)) FROM t;
SELECT g, count(*), sum(s) FROM u GROUP BY g ORDER BY g LIMIT 10;
SELECT k, v FROM t WHERE k BETWEEN 'key001000' AND 'key001010' ORDER BY k;
SELECT v % 10 AS b, count(*), avg(length(pad)) FROM t GROUP BY b ORDER BY b;
