SELECT count(*), sum(('x' || substr(md5(t::text), 1, 16))::bit(64)::bigint) FROM s.t AS t;
