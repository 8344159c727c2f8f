-- Store a job's final result (lib_store.lua's store, with its KEYS and ARGV 1-21; ARGV 22
-- this call's token, 23 its ttl, 24 the spec hash of the job that ran ('' for no check)).
return store(KEYS, ARGV, ARGV[22], ARGV[23], ARGV[24])
