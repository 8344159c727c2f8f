-- Store a job's final result (lib_store.lua's store, with its KEYS and ARGV).
return store(KEYS, ARGV)
