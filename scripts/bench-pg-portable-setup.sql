
DROP SCHEMA IF EXISTS s CASCADE;
CREATE SCHEMA s;
CREATE TABLE s.t (id BIGINT, small SMALLINT, amount NUMERIC(12,2), ratio DOUBLE PRECISION, name TEXT, day DATE, ts TIMESTAMP, flag BOOLEAN, raw BYTEA);
INSERT INTO s.t
SELECT g,
  CASE WHEN g % 17 = 0 THEN NULL ELSE ((g * 7919) % 65536 - 32768)::smallint END,
  CASE WHEN g % 19 = 0 THEN NULL ELSE round(((g * 104729) % 19999999999 - 9999999999)::numeric / 100, 2) END,
  CASE WHEN g % 23 = 0 THEN NULL
       WHEN g % 101 = 1 THEN 'NaN'::float8 WHEN g % 101 = 2 THEN 'Infinity' WHEN g % 101 = 3 THEN '-Infinity'
       WHEN g % 101 = 4 THEN '-0'::float8 WHEN g % 101 = 5 THEN 0 WHEN g % 101 = 6 THEN 1e-300 WHEN g % 101 = 7 THEN 4.9e-324::float8
       WHEN g % 101 = 8 THEN -2.5e-310::float8 WHEN g % 101 = 9 THEN 1.7976931348623157e308::float8 WHEN g % 101 = 10 THEN -1.7976931348623157e308::float8
       WHEN g % 101 = 11 THEN 2.2250738585072014e-308::float8 WHEN g % 101 = 12 THEN 2.2250738585072009e-308::float8
       ELSE (sin(g) * 10 ^ ((g % 40) - 20))::float8 END,
  CASE WHEN g % 29 = 0 THEN NULL WHEN g % 29 = 1 THEN '' WHEN g % 29 = 2 THEN 'a|b\c\\d||' WHEN g % 29 = 3 THEN '\N'
       WHEN g % 29 = 4 THEN 'ünïcödé ✓ ''quoted'' 日本語 😀' WHEN g % 997 = 5 THEN repeat('long|text\', 5000)
       WHEN g % 29 = 6 THEN 'NULL' ELSE 'name-' || md5(g::text) END,
  CASE WHEN g % 31 = 0 THEN NULL WHEN g % 31 = 1 THEN DATE '0001-01-01' WHEN g % 31 = 2 THEN DATE '9999-12-31' ELSE DATE '1960-01-01' + (g % 40000)::int END,
  CASE WHEN g % 37 = 0 THEN NULL WHEN g % 37 = 1 THEN TIMESTAMP '0001-01-01 00:00:00' WHEN g % 37 = 2 THEN TIMESTAMP '9999-12-31 23:59:59.999999'
       ELSE TIMESTAMP '1950-01-01' + (g * 9876543211::bigint % 3000000000000000) * INTERVAL '1 microsecond' END,
  CASE WHEN g % 41 = 0 THEN NULL ELSE g % 2 = 0 END,
  CASE WHEN g % 43 = 0 THEN NULL WHEN g % 43 = 1 THEN ''::bytea ELSE decode(substr(md5(g::text), 1, ((g % 16) * 2)::int), 'hex') END
FROM generate_series(1::bigint, :rows) g;
INSERT INTO s.t VALUES (NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL), (NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL);
VACUUM ANALYZE s.t;
SELECT count(*) FROM s.t;
