# The gRPC store's tests (collectives/grpc/). Without gRPC, only the stub's.
if(NOT TESSEL_HAVE_GRPC)
  tessel_add_test(store_stub_test SOURCES store_stub_test.cc LIBS tessel::collectives)
  return()
endif()
tessel_add_test(store_server_test SOURCES store_server_test.cc LIBS tessel::collectives)
tessel_add_test(store_concurrency_test SOURCES store_concurrency_test.cc
                LIBS tessel::collectives)
tessel_add_test(store_multiprocess_test SOURCES store_multiprocess_test.cc
                LIBS tessel::collectives LABELS multiprocess NO_MAIN TIMEOUT 90)
tessel_add_test(store_table_test SOURCES store_table_test.cc LIBS tessel::collectives)
